"""pipe clean: discover -> process each file in workers -> decide over all results -> write the folder."""
