"""Grid cells that several stages open alike: an NMT cell (trained, evaluated, its heads
analysed), an APE cell, a translation cell of the synthetic-APE stage. Not stages."""
