"""The stand-in's `spaces.zero`: only what SpecDemo reads of it (`config`)."""
