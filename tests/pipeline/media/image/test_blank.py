"""Images that would come out blank (issue 14, item 7).

White artwork on a transparent background became a solid white 512x512 square under the default
`--background white` (5 of 73 real wallpapers), and two such blanks were then exact duplicates of
each other. Now artwork the background would erase goes on the contrasting colour, and an
output that is still one flat colour (a solid-colour image, a fully transparent one) is
quarantined as blank_image, whatever made it flat.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from pipeline.formats.vocabulary import Reason
from pipeline.media.image.clean import ImageSettings, clean_image
from tests.image_samples import png
from tests.image_samples import transparent_logo as logo

WHITE, BLACK = (255, 255, 255), (0, 0, 0)


def output(o) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(o.data)).convert("RGB")).astype(int)


def test_white_artwork_on_transparency_goes_on_black_not_into_a_white_square():
    o = clean_image(logo(WHITE), ImageSettings(format="png"))
    assert o.reason is None, o.detail
    out = output(o)
    content = out[86:426]  # 300x200 padded to 512x512: the picture is the middle band
    assert (content == 0).all(axis=2).mean() > 0.3 and (content == 255).all(axis=2).mean() > 0.2
    assert any("composited on #000000 instead of --background #ffffff" in n for n in o.notes), o.notes
    assert (out[:80] == 255).all() and (out[432:] == 255).all()  # the padding keeps --background


def test_dark_artwork_under_a_black_background_goes_on_white():
    o = clean_image(logo(BLACK), ImageSettings(format="png", background=BLACK))
    assert o.reason is None, o.detail
    content = output(o)[86:426]
    assert (content == 255).all(axis=2).mean() > 0.3 and (content == 0).all(axis=2).mean() > 0.2
    assert any("composited on #ffffff instead of --background #000000" in n for n in o.notes), o.notes


@pytest.mark.parametrize("colour, background", [((200, 30, 30), WHITE), (WHITE, (0, 0, 128)), ((250, 250, 250), BLACK)])
def test_artwork_the_background_does_not_erase_stays_on_the_background(colour, background):
    o = clean_image(logo(colour), ImageSettings(format="png", background=background))
    assert o.reason is None and not any("composited on" in n for n in o.notes), o.notes
    content = output(o)[86:426]
    assert (np.abs(content - background).max(axis=2) <= 1).mean() > 0.3  # the transparency is the background


def flat_images():
    solid = Image.new("RGB", (320, 240), (40, 90, 200))
    jpeg = io.BytesIO()
    solid.save(jpeg, "JPEG", quality=90)
    clear = Image.new("RGBA", (320, 240), (255, 255, 255, 0))
    veiled = Image.new("RGBA", (320, 240), (10, 200, 10, 128))  # transparency with no shape in it
    art = Image.open(io.BytesIO(logo(WHITE))).convert("RGBA")
    # the same artwork already flattened on white, as the old output was: nothing left to save it
    white_on_white = Image.alpha_composite(Image.new("RGBA", art.size, (*WHITE, 255)), art).convert("RGB")
    return {"solid colour PNG": png(solid), "solid colour JPEG": jpeg.getvalue(), "fully transparent": png(clear),
            "uniformly half transparent": png(veiled), "white on opaque white": png(white_on_white),
            "grey": png(Image.new("L", (64, 64), 17))}


@pytest.mark.parametrize("name", list(flat_images()))
def test_one_flat_colour_is_blank_image_whatever_made_it_flat(name):
    o = clean_image(flat_images()[name], ImageSettings())
    assert o.reason == Reason.BLANK_IMAGE, (name, o.reason, o.detail)
    assert "one flat colour" in o.detail and o.data is None


@pytest.mark.parametrize("mode", ["pad", "crop", "stretch"])
def test_faint_but_real_content_is_kept(mode):
    rng = np.random.default_rng(3)
    ramp = np.tile(np.linspace(100, 110, 256), (192, 1))  # a faint gradient: a dusk sky
    grain = np.clip(rng.normal(128, 3, (192, 256)), 0, 255)  # sensor noise on a grey card
    for arr in (ramp, grain):
        rgb = np.repeat(arr[:, :, None], 3, axis=2).round().astype(np.uint8)
        o = clean_image(png(Image.fromarray(rgb)), ImageSettings(resize_mode=mode))
        assert o.reason is None, o.detail
