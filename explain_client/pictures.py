"""Pictures of image explanations: the patch scores upsampled over the input image, the patch grid alone, and a
panel of the input beside one overlay per method. Needs the ``pictures`` extra (``pip install
'./explain_client[pictures]'``: Pillow and NumPy); the colours are those of :func:`explain_client.words.score_rgb`.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

try:
    import numpy as np
    from PIL import Image, ImageDraw
except ImportError as error:
    raise ImportError(
        "image pictures (explain --png, image explanations in --html) need Pillow and NumPy: "
        "pip install './explain_client[pictures]' (or pip install pillow numpy)"
    ) from error

from .results import Explanation, Prediction
from .words import NEGATIVE_RGB, POSITIVE_RGB, normalise


def _colour_map(values: np.ndarray) -> np.ndarray:
    """``(H, W)`` normalised scores in [-1, 1] → ``(H, W, 3)`` uint8 colours of :func:`score_rgb`."""
    clipped = np.clip(values, -1.0, 1.0)[..., None]
    white = np.full(3, 255.0)
    positive = white * (1 - clipped) + np.asarray(POSITIVE_RGB, dtype=float) * clipped
    negative = white * (1 + clipped) + np.asarray(NEGATIVE_RGB, dtype=float) * (-clipped)
    return np.where(clipped >= 0, positive, negative).round().astype(np.uint8)


def upsample_scores(explanation: Explanation, size: tuple[int, int]) -> np.ndarray:
    """The patch grid's normalised scores upsampled (bilinear) to ``size = (width, height)``, in ``[-1, 1]``.

    Raises:
        ValueError: for a text explanation.
    """
    grid = np.asarray(explanation.score_grid(), dtype=np.float32)
    values = np.asarray(normalise(grid.flatten().tolist()), dtype=np.float32).reshape(grid.shape)
    image = Image.fromarray(values, mode="F").resize(size, Image.Resampling.BILINEAR)
    return np.asarray(image, dtype=np.float32)


def grid_png(explanation: Explanation, cell: int = 24) -> bytes:
    """The patch grid alone as a PNG (``cell`` pixels per patch, no smoothing)."""
    grid = np.asarray(explanation.score_grid(), dtype=np.float32)
    values = np.asarray(normalise(grid.flatten().tolist()), dtype=np.float32).reshape(grid.shape)
    picture = Image.fromarray(_colour_map(values)).resize(
        (grid.shape[1] * cell, grid.shape[0] * cell), Image.Resampling.NEAREST
    )
    buffer = io.BytesIO()
    picture.save(buffer, "PNG")
    return buffer.getvalue()


def overlay_image(image_bytes: bytes, explanation: Explanation, side: int = 256, alpha: float = 0.6) -> Image.Image:
    """The input image (scaled so its longer side is ``side`` pixels, nearest neighbour) with the patch scores,
    upsampled bilinearly to the same size, blended over it (``alpha`` = weight of the heat map)."""
    source = Image.open(io.BytesIO(image_bytes)).convert("RGB")
    scale = side / max(source.size)
    size = (max(1, round(source.width * scale)), max(1, round(source.height * scale)))
    base = np.asarray(source.resize(size, Image.Resampling.NEAREST), dtype=np.float32)
    heat = _colour_map(upsample_scores(explanation, size)).astype(np.float32)
    blended = (1 - alpha) * base + alpha * heat
    return Image.fromarray(blended.round().clip(0, 255).astype(np.uint8))


def overlay_png(image_bytes: bytes, explanation: Explanation, side: int = 256) -> bytes:
    """:func:`overlay_image` encoded as PNG bytes."""
    buffer = io.BytesIO()
    overlay_image(image_bytes, explanation, side).save(buffer, "PNG")
    return buffer.getvalue()


def image_panel(image_bytes: bytes, predictions: Sequence[Prediction], side: int = 256) -> Image.Image:
    """The input image and one overlay per explained prediction side by side, each captioned.

    Raises:
        ValueError: if a prediction carries no image explanation.
    """
    source = Image.open(io.BytesIO(image_bytes)).convert("RGB")
    scale = side / max(source.size)
    size = (max(1, round(source.width * scale)), max(1, round(source.height * scale)))
    tiles = [
        (f"input: {predictions[0].label}" if predictions else "input", source.resize(size, Image.Resampling.NEAREST))
    ]
    for prediction in predictions:
        explanation = prediction.explanation
        if explanation is None or explanation.grid is None:
            raise ValueError("every prediction must carry an image explanation")
        tiles.append(
            (f"{explanation.method} ({explanation.target_label})", overlay_image(image_bytes, explanation, side))
        )
    caption = 22
    margin = 8
    canvas = Image.new("RGB", (margin + len(tiles) * (size[0] + margin), size[1] + caption + 2 * margin), "white")
    draw = ImageDraw.Draw(canvas)
    for index, (label, tile) in enumerate(tiles):
        left = margin + index * (size[0] + margin)
        canvas.paste(tile, (left, margin + caption))
        draw.text((left, margin), label, fill=(0, 0, 0))
    return canvas
