"""Keys: webdataset-safe, unique, shared by an image and its caption."""

from dataclasses import dataclass

from pipeline.clean.keys import assign_keys, slug


@dataclass
class C:
    source: str
    kind: str
    key: str = ""


def test_slug_is_safe():
    k = slug("cats/Tabby Cat.01.JPG")
    assert k == "cats__Tabby_Cat_01"
    assert "." not in k and "/" not in k


def test_caption_pair_shares_key_and_collisions_are_split():
    cs = [C("c/a.jpg", "image"), C("c/a.txt", "text"), C("c/b.jpg", "image"), C("c/b.png", "image"),
          C("c/x y.jpg", "image"), C("c/x_y.jpg", "image")]
    assign_keys(cs)
    keys = {c.source: c.key for c in cs}
    assert keys["c/a.jpg"] == keys["c/a.txt"] == "c__a"
    assert keys["c/b.jpg"] != keys["c/b.png"]
    assert keys["c/x y.jpg"] != keys["c/x_y.jpg"]
    non_pair = [k for s, k in keys.items() if s not in ("c/a.jpg", "c/a.txt")]
    assert len(set(non_pair)) == len(non_pair)
    assert all("." not in k and "/" not in k for k in keys.values())


def test_unicode_names_do_not_collide():
    cs = [C("猫/一.jpg", "image"), C("猫/二.jpg", "image")]
    assign_keys(cs)
    assert cs[0].key != cs[1].key
