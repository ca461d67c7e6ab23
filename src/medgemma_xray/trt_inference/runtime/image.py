"""The Gemma 3 image processor's arithmetic in numpy (resize with PIL, rescale, normalise), for torch-free hosts."""

from __future__ import annotations

import numpy as np


class ImagePreprocessor:
    def __init__(self, config: dict) -> None:
        size = config.get("size", {"height": 896, "width": 896})
        self.size = (int(size["width"]), int(size["height"]))
        self.resample = int(config.get("resample", 2))
        self.rescale = float(config.get("rescale_factor", 1 / 255))
        self.mean = np.asarray(config.get("image_mean", [0.5] * 3), dtype=np.float32)[:, None, None]
        self.std = np.asarray(config.get("image_std", [0.5] * 3), dtype=np.float32)[:, None, None]

    def __call__(self, images) -> np.ndarray:
        """float32 pixel_values of shape (len(images), 3, height, width)."""
        batch = []
        for image in images:
            resized = image.convert("RGB").resize(self.size, resample=self.resample)
            pixels = np.asarray(resized, dtype=np.float32).transpose(2, 0, 1) * np.float32(self.rescale)
            batch.append((pixels - self.mean) / self.std)
        return np.stack(batch).astype(np.float32)
