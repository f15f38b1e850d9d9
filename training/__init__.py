"""Scripts that train what SpecDemo's methods load from assets/ (run on a CPU, seeded)."""
