"""The reporting package imports no torch: the tables stage and the report need no NMT stack."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "learnable_sparsity" / "reporting"


def test_no_reporting_module_imports_torch() -> None:
    modules = sorted(
        f"learnable_sparsity.reporting.{m.name}" for m in pkgutil.iter_modules([str(PACKAGE)])
    )
    assert {"table", "published", "render", "nmt_tables", "lvm_tables", "figures"} <= {
        name.rsplit(".", 1)[1] for name in modules
    }
    code = f"import sys; import {', '.join(modules)}; assert 'torch' not in sys.modules"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"{code}\n{result.stdout}{result.stderr}"
