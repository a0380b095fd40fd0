"""The SWORD reader (``learnable_sparsity.data.sword``) on modules written in the packages' byte format
(:mod:`tests.data.sword_fixture`), its Debian-package download on the loopback server, and, where
Debian's ``sword-text-web`` / ``sword-text-sparv`` are installed (``make test`` installs them
where apt-get can), the real translations."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from learnable_sparsity.data import sword
from learnable_sparsity.data.corpora import corpus_settings, load_corpus, source_language
from learnable_sparsity.data.sword import (
    SYSTEM_LIBRARY,
    DebianPackage,
    Module,
    VerseKey,
    aligned_verses,
    module_fingerprint,
    module_library,
    osis_text,
    read_module,
    split_by_chapter,
)
from learnable_sparsity.errors import LearnableSparsityError
from learnable_sparsity.settings import SettingsError
from tests.data.sword_fixture import debian_package, slots_of, write_module

if TYPE_CHECKING:
    from tests.loopback import LoopbackServer

SPANISH = {
    "ot": slots_of(
        {
            "Gen": [
                [
                    '<w lemma="strong:H7225">EN el principio</w> crió<note placement="foot">'
                    "<reference>1:1 </reference>nota</note> Dios.",
                    "",  # an empty slot: the verse is missing in this translation
                    "Y dijo Dios: Sea la luz.",
                ],
                ["¿Dónde estás tú?", "Y él respondió &amp; calló."],
            ],
            "Exod": [["Estos son los nombres."]],
        }
    ),
    "nt": slots_of({"Matt": [['<title type="section">Genealogía</title>LIBRO de la generación.']]}),
}
ENGLISH = {
    "ot": slots_of(
        {
            "Gen": [
                [
                    "In the beginning, God<note>a footnote</note>created.",
                    "The earth was formless.",
                    "God said, “Let there be light.”",
                    "A verse this versification adds.",
                ],
                ["“Where are you?”", "He answered."],
            ],
            "Exod": [["These are the names."]],
        }
    ),
    "nt": slots_of({"Matt": [["The book of the genealogy ."]]}),
}


@pytest.fixture
def library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A library with a Spanish and an English test module, known to the reader's registry."""
    root = tmp_path / "sword"
    write_module(root, "spaTest", SPANISH)
    write_module(root, "engTest", ENGLISH, block_slots=3)
    package = DebianPackage("https://deb.example/none.deb", "0" * 64)
    monkeypatch.setitem(sword.MODULES, "spaTest", Module("es", package))
    monkeypatch.setitem(sword.MODULES, "engTest", Module("en", package))
    return root


def test_verses_are_numbered_by_the_chapter_milestones(library: Path) -> None:
    verses = read_module(library, "spaTest")
    assert list(verses) == [
        VerseKey("Gen", 1, 1),
        VerseKey("Gen", 1, 2),
        VerseKey("Gen", 1, 3),
        VerseKey("Gen", 2, 1),
        VerseKey("Gen", 2, 2),
        VerseKey("Exod", 1, 1),  # the book heading slot before it is no verse of Gen 2
        VerseKey("Matt", 1, 1),
    ]
    assert verses[VerseKey("Gen", 1, 2)] == ""
    assert verses[VerseKey("Gen", 2, 2)] == "Y él respondió &amp; calló."
    assert len(read_module(library, "engTest")) == 8


@pytest.mark.parametrize(
    ("markup", "text"),
    [
        (
            '<w lemma="strong:H1">God</w><note n="a">x <b>y</b></note><w>created</w>.',
            "God created.",
        ),
        ("Amen <note/>.", "Amen."),
        ('<title type="section">Heading</title>The text', "The text"),
        ('<title canonical="true" type="psalm">A Psalm.</title> <l/>Yahweh', "A Psalm. Yahweh"),
        ("<q who='Jesus'>“Yes &amp; no”</q> , he said", "“Yes & no”, he said"),
        ("<divineName>Yahweh</divineName>\n  said  ", "Yahweh said"),
        (  # the Reina-Valera's added words touch their neighbours (Gen 7:4)
            '<w s="H3588">Porque</w><transChange type="added">pasados</transChange><w s="H5750">'
            "aún</w> <w>siete</w>",
            "Porque pasados aún siete",
        ),
        (
            "hay allí<transChange>también</transChange>: y (<transChange>x</transChange>)",
            "hay allí también: y (x)",
        ),
        ("<w>sáca</w><transChange>lo</transChange><w>de</w> allí", "sácalo de allí"),
    ],
)
def test_osis_markup_becomes_plain_text(markup: str, text: str) -> None:
    assert osis_text(markup) == text


def test_verses_align_on_book_chapter_and_verse(library: Path) -> None:
    rows = aligned_verses(read_module(library, "spaTest"), read_module(library, "engTest"))
    assert rows == [
        (VerseKey("Gen", 1, 1), "EN el principio crió Dios.", "In the beginning, God created."),
        (VerseKey("Gen", 1, 3), "Y dijo Dios: Sea la luz.", "God said, “Let there be light.”"),
        (VerseKey("Gen", 2, 1), "¿Dónde estás tú?", "“Where are you?”"),
        (VerseKey("Gen", 2, 2), "Y él respondió & calló.", "He answered."),
        (VerseKey("Exod", 1, 1), "Estos son los nombres.", "These are the names."),
        (VerseKey("Matt", 1, 1), "LIBRO de la generación.", "The book of the genealogy."),
    ]


def test_a_chapter_heading_without_its_milestone_is_refused(tmp_path: Path) -> None:
    slots = slots_of({"Gen": [["a"], ["b"], ["c"]]})
    slots[slots.index("b") - 1] = ""  # chapter 2's heading lost its milestone
    write_module(tmp_path, "broken", {"ot": slots})
    with pytest.raises(LearnableSparsityError, match="broken: Gen chapter 3 follows chapter 1"):
        read_module(tmp_path, "broken")


def test_a_module_this_reader_cannot_decode_is_refused_by_its_conf_entry(tmp_path: Path) -> None:
    write_module(tmp_path, "raw", {"ot": slots_of({"Gen": [["a"]]})}, conf={"ModDrv": "RawText"})
    with pytest.raises(LearnableSparsityError, match="ModDrv=RawText; this reader decodes"):
        read_module(tmp_path, "raw")


def test_a_missing_module_names_the_debian_package(tmp_path: Path) -> None:
    with pytest.raises(LearnableSparsityError, match="sudo apt install sword-text-sparv"):
        read_module(tmp_path, "spaRV1909eb")
    with pytest.raises(LearnableSparsityError, match=r"lacks the module\(s\) \['engWEB2015eb'\]"):
        module_library(["engWEB2015eb"], tmp_path, tmp_path / "cache")


def _rows(chapters: dict[tuple[str, int], int]) -> list[tuple[VerseKey, str, str]]:
    return [
        (VerseKey(book, number, verse), f"{book}{number}:{verse}", "t")
        for (book, number), verses in chapters.items()
        for verse in range(1, verses + 1)
    ]


def test_splits_take_whole_chapters_until_they_hold_their_size() -> None:
    rows = _rows({("Gen", c): 5 for c in range(1, 21)} | {("Matt", 1): 7})
    splits = split_by_chapter(rows, {"valid": 8, "test": 11}, seed=3)
    assert list(splits) == ["train", "valid", "test"]
    chapters = {name: {s.split(":")[0] for s, _ in pairs} for name, pairs in splits.items()}
    assert sum(len(pairs) for pairs in splits.values()) == len(rows)
    assert not (chapters["train"] & chapters["valid"] or chapters["train"] & chapters["test"])
    for name, size in (("valid", 8), ("test", 11)):
        # at least the size, and one chapter fewer would not be: no chapter too many
        biggest = max(7 if c == "Matt1" else 5 for c in chapters[name])
        assert size <= len(splits[name]) < size + biggest
    order = [source for _, source, _ in rows]
    assert all(
        [order.index(s) for s, _ in pairs] == sorted(order.index(s) for s, _ in pairs)
        for pairs in splits.values()
    )
    assert split_by_chapter(rows, {"valid": 8, "test": 11}, seed=3) == splits
    assert split_by_chapter(rows, {"valid": 8, "test": 11}, seed=4) != splits


def test_splits_refuse_sizes_the_verses_cannot_fill() -> None:
    rows = _rows({("Gen", 1): 3, ("Gen", 2): 3})
    with pytest.raises(LearnableSparsityError, match="cannot fill the splits"):
        split_by_chapter(rows, {"valid": 3, "test": 4}, seed=0)
    with pytest.raises(LearnableSparsityError, match="leave no aligned verse for train"):
        split_by_chapter(rows, {"valid": 3, "test": 3}, seed=0)


def test_a_module_fingerprint_changes_with_its_text_and_its_version(library: Path) -> None:
    first = module_fingerprint(library, "spaTest")
    assert first == module_fingerprint(library, "spaTest")  # the same files, the same print
    assert first["version"] == "unknown"  # no Version entry in the conf
    assert first != module_fingerprint(library, "engTest")
    changed = {**SPANISH, "nt": slots_of({"Matt": [["LIBRO de otra generación."]]})}
    write_module(library, "spaTest", changed)
    assert module_fingerprint(library, "spaTest")["sha256"] != first["sha256"]
    write_module(library, "spaTest", SPANISH, conf={"Version": "1.2"})
    assert module_fingerprint(library, "spaTest") == {**first, "version": "1.2"}


def test_a_sword_corpus_loads_through_the_corpus_settings(library: Path) -> None:
    entry = {
        "source": "sword",
        "source_module": "spaTest",
        "target_module": "engTest",
        "library": str(library),
        "sizes": {"valid": 1, "test": 1},
        "max_words": 5,
    }
    settings = corpus_settings(entry, "corpora.bible")
    splits = load_corpus(settings)
    assert source_language(settings) == "es"
    assert list(splits) == ["train", "valid", "test"]
    kept = sorted(pair for pairs in splits.values() for pair in pairs)
    assert ("Y dijo Dios: Sea la luz.", "God said, “Let there be light.”") not in kept  # 6 words
    assert len(kept) == 5 and ("¿Dónde estás tú?", "“Where are you?”") in kept
    assert all(splits.values())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"source_module": "spaNone"}, "source_module is 'spaNone'; known"),
        ({"target_module": "spaTest"}, "must differ from source_module"),
        ({"sizes": {"train": 9, "valid": 1, "test": 1}}, "not train"),
        ({"sizes": {"valid": 1}}, "must name valid and test"),
        ({"max_words": 0}, "max_words"),
    ],
)
def test_sword_corpus_settings_refuse_bad_values(library: Path, change: dict, message: str) -> None:
    entry = {"source": "sword", "source_module": "spaTest", "target_module": "engTest"}
    entry |= {"sizes": {"valid": 1, "test": 1}} | change
    with pytest.raises(SettingsError, match=message):
        corpus_settings(entry, "corpora.bible")


def test_the_debian_packages_download_checked_and_unpack_into_the_cache(
    library: Path, tmp_path: Path, server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    deb = debian_package(library)
    server.files["/pool/sword-text-test_1.0_all.deb"] = deb
    url = server.url("/pool/sword-text-test_1.0_all.deb")
    for name, lang in (("spaTest", "es"), ("engTest", "en")):
        package = DebianPackage(url, hashlib.sha256(deb).hexdigest())
        monkeypatch.setitem(sword.MODULES, name, Module(lang, package))
    monkeypatch.setattr(sword, "SYSTEM_LIBRARY", tmp_path / "no-system-library")
    cache = tmp_path / "cache"
    unpacked = module_library(["spaTest", "engTest"], None, cache)
    assert unpacked == cache / "sword"
    assert read_module(unpacked, "engTest") == read_module(library, "engTest")
    assert (cache / "sword-text-test_1.0_all.deb").read_bytes() == deb
    monkeypatch.setitem(sword.MODULES, "spaTest", Module("es", DebianPackage(url, "1" * 64)))
    (cache / "sword-text-test_1.0_all.deb").unlink()
    with pytest.raises(LearnableSparsityError, match="sha256"):
        module_library(["spaTest"], None, tmp_path / "other-cache")


REAL = ["spaRV1909eb", "engWEB2015eb"]


@pytest.mark.skipif(
    bool(sword.missing_modules(SYSTEM_LIBRARY, REAL)),
    reason="Debian's sword-text-sparv and sword-text-web are not installed (make test installs "
    "them where apt-get can); the reader is tested on modules in their format above",
)
def test_the_real_translations_align_verse_by_verse() -> None:
    spanish, english = (read_module(SYSTEM_LIBRARY, name) for name in REAL)
    assert len(spanish) == 31_102  # the KJV versification's verses
    rows = aligned_verses(spanish, english)
    assert len(rows) == 31_076
    texts = {key: (source, target) for key, source, target in rows}
    assert texts[VerseKey("Gen", 1, 1)] == (
        "EN el principio crió Dios los cielos y la tierra.",
        "In the beginning, God created the heavens and the earth.",
    )
    # The psalm superscription: untagged in the Spanish verse 1, a canonical title in the English.
    spanish_psalm, english_psalm = texts[VerseKey("Ps", 3, 1)]
    assert spanish_psalm.startswith("Salmo de David, cuando huía de delante de Absalom")
    assert english_psalm.startswith("A Psalm by David, when he fled from Absalom his son.")
    assert texts[VerseKey("Rev", 22, 21)][1].startswith("The grace of the Lord Jesus Christ")
    assert not any(
        "<" in source + target or "strong:" in source + target for _, source, target in rows
    )
