"""Texts: encoding detection and strict decoding, then normalisation to UTF-8 NFC."""
