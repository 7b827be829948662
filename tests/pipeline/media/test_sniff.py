"""Magic-byte classification."""

import pytest

from pipeline.media.sniff import sniff


@pytest.mark.parametrize("head,name,kind", [
    (b"\xff\xd8\xff\xe0\x00\x10JFIF", "a.txt", "image"),
    (b"\x89PNG\r\n\x1a\n", "a.jpg", "image"),
    (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "x", "image"),
    (b"BM\x36\x00\x0c\x00\x00\x00\x00\x00", "x.bmp", "image"),
    (b"BMW is a car brand", "cap.txt", "text"),
    (b"MZ is a caption", "cap.txt", "text"),
    (b"MZ\x90\x00\x03\x00\x00\x00", "setup.exe", "other"),
    (b"PK\x03\x04\x14\x00", "data.jpg", "other"),
    (b"\x00\x00\x00\x01Bud1\x00", ".DS_Store", "other"),
    (b"[.ShellClassInfo]", "desktop.ini", "other"),
    (b"\x00\x00\x00\x18ftypheic", "IMG_1.HEIC", "image"),
    (b"\x00\x00\x00\x18ftypisom", "clip.mp4", "other"),
    (b"P6\n640 480\n255\n", "x.ppm", "image"),
    (b"P1 is the first prize", "cap.txt", "text"),
    (b"%PDF-1.7\n", "doc.txt", "other"),
    (b"just some words", "notes", "text"),
    (b"", "empty.jpg", "image"),
])
def test_sniff(head, name, kind):
    assert sniff(head, name)[0] == kind


def _wav() -> bytes:
    import io
    import wave

    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\0\0" * 100)
    return out.getvalue()


@pytest.mark.parametrize("head,kind", [
    (_wav()[:64], "other"),
    (b"RIFF\x24\x10\x00\x00AVI LIST\x10\x01\x00\x00hdrlavih" + bytes(40), "other"),
    ("RIFF garso įrašas".encode("cp1257"), "text"),  # a caption shorter than a RIFF header
    (b"RIFF (Resource Interchange File Format) is a container for chunks", "text"),
    (b"RIFF AVI LIST and WAVE fmt are the chunk names of two RIFF forms", "text"),
    (b"RIFFRIFFRIFFRIFFRIFFRIFFRIFFRIFF", "text"),
])
def test_a_file_is_riff_media_by_its_header_not_by_its_first_four_bytes(head, kind):
    assert sniff(head, "x")[0] == kind
