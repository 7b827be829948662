"""Discovery: every file once, sorted, by content, never leaving the input root."""

import os

from pipeline.clean.discover import discover
from tests.factories import photo, write


def test_sorted_and_labelled_by_class_folder(tmp_path):
    photo(tmp_path / "dogs" / "b.jpg")
    photo(tmp_path / "cats" / "a.jpg")
    write(tmp_path / "loose.txt", "hello")
    cands = discover(tmp_path)
    assert [c.source for c in cands] == ["cats/a.jpg", "dogs/b.jpg", "loose.txt"]
    assert [c.label for c in cands] == ["cats", "dogs", None]
    assert [c.kind for c in cands] == ["image", "image", "text"]


def test_content_not_extension_decides(tmp_path):
    png = photo(tmp_path / "x" / "really_png.jpg", fmt="PNG")
    write(tmp_path / "x" / "text.png", "just words")
    write(tmp_path / "x" / "archive.jpg", b"PK\x03\x04" + bytes(60))
    kinds = {c.source: (c.kind, c.fmt) for c in discover(tmp_path)}
    assert kinds["x/really_png.jpg"] == ("image", "PNG")
    assert kinds["x/text.png"][0] == "image"  # named like an image: the decoder decides (and refuses)
    assert kinds["x/archive.jpg"] == ("other", "ZIP archive")
    assert png.exists()


def test_symlink_out_of_root_is_a_row_not_followed(tmp_path):
    outside = tmp_path / "outside"
    photo(outside / "secret.jpg")
    root = tmp_path / "root"
    photo(root / "c" / "ok.jpg")
    os.symlink(outside / "secret.jpg", root / "c" / "link.jpg")
    os.symlink(outside, root / "dirlink")
    cands = {c.source: c for c in discover(root)}
    assert cands["c/link.jpg"].problem == "outside_root"
    assert cands["dirlink"].problem == "outside_root"
    assert not any("secret" in s for s in cands)


def test_symlink_inside_root_and_cycles(tmp_path):
    photo(tmp_path / "a" / "x.jpg")
    os.symlink(tmp_path / "a" / "x.jpg", tmp_path / "a" / "y.jpg")
    os.symlink(tmp_path, tmp_path / "a" / "loop")  # a cycle back to the root
    cands = {c.source: c for c in discover(tmp_path)}
    assert set(cands) == {"a/x.jpg", "a/y.jpg", "a/loop"}  # the cycle is one row, never walked
    assert cands["a/y.jpg"].problem is None
    assert cands["a/loop"].problem == "unsupported_format" and "INPUT itself" in cands["a/loop"].detail


def test_a_link_to_a_folder_never_relabels_its_files(tmp_path):
    """A link that sorts before its target ("alias" < "zebra"), or sits in another class folder,
    must not take the folder's files under its own name and label: they stay zebra's, and each
    link is a row of its own."""
    photo(tmp_path / "zebra" / "z1.jpg")
    photo(tmp_path / "cats" / "c1.jpg")
    os.symlink("zebra", tmp_path / "alias")
    os.symlink("../zebra", tmp_path / "cats" / "sub")
    cands = {c.source: c for c in discover(tmp_path)}
    assert set(cands) == {"alias", "cats/c1.jpg", "cats/sub", "zebra/z1.jpg"}
    assert cands["zebra/z1.jpg"].label == "zebra" and cands["zebra/z1.jpg"].problem is None
    for link in ("alias", "cats/sub"):
        assert cands[link].problem == "unsupported_format"
        assert "link to the folder zebra" in cands[link].detail


def test_broken_link_and_fifo_are_reported(tmp_path):
    os.symlink(tmp_path / "missing", tmp_path / "broken.jpg")
    os.mkfifo(tmp_path / "pipe.txt")
    cands = {c.source: c for c in discover(tmp_path)}
    assert cands["broken.jpg"].problem == "unreadable"
    assert cands["pipe.txt"].problem == "unsupported_format"


def test_non_utf8_file_name_becomes_valid_text(tmp_path):
    name = b"caf\xe9.txt"  # latin-1 bytes in a file name
    with open(os.path.join(os.fsencode(tmp_path), name), "wb") as f:
        f.write(b"hello")
    (c,) = discover(tmp_path)
    c.source.encode("utf-8")  # must not raise
    assert c.source == "caf\\xe9.txt"


def test_formats_without_magic_in_our_table_are_found_by_pillow(tmp_path):
    """SGI, PCX and friends have no entry in sniff's table: Pillow recognises them by content,
    whatever their name, so they are images, not 'binary text'."""
    from PIL import Image

    from tests.factories import noise_rgb

    im = Image.fromarray(noise_rgb(64, 48))
    im.save(tmp_path / "texture.dat", "SGI")
    im.save(tmp_path / "scan.bin", "PCX")
    write(tmp_path / "blob.bin", bytes(range(256)) * 4)  # binary, but no image
    kinds = {c.source: (c.kind, c.fmt) for c in discover(tmp_path)}
    assert kinds["texture.dat"] == ("image", "SGI")
    assert kinds["scan.bin"] == ("image", "PCX")
    assert kinds["blob.bin"][0] == "text"  # the text stage will call it binary_content


def test_hidden_and_tool_folders_are_one_row_each_not_a_class(tmp_path):
    """Jupyter's checkpoint copies must not become a class whose duplicates conflict with the
    real files' labels; a .git folder is not data. Each such folder is one row with a reason."""
    photo(tmp_path / "cats" / "c1.jpg")
    photo(tmp_path / "cats" / ".ipynb_checkpoints" / "c1-checkpoint.jpg")
    photo(tmp_path / "__MACOSX" / "cats" / "._c1.jpg")
    (tmp_path / ".git" / "objects").mkdir(parents=True)
    (tmp_path / ".git" / "objects" / "ab").write_bytes(b"x\x9c" + bytes(40))
    cands = {c.source: c for c in discover(tmp_path)}
    assert set(cands) == {"cats/c1.jpg", "cats/.ipynb_checkpoints", "__MACOSX", ".git"}
    assert cands["cats/c1.jpg"].problem is None
    for folder in ("cats/.ipynb_checkpoints", "__MACOSX", ".git"):
        assert cands[folder].problem == "unsupported_format" and "1 file inside" in cands[folder].detail
