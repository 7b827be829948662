"""How one input file is recognised, judged and normalised, by kind (image, text)."""
