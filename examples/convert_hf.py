"""Convert a Hugging Face dataset (and a Parquet file) with zrecord.convert, then train from it.

Builds a small `datasets.Dataset` locally (no hub download): token lists, a ClassLabel and an
Image column of PNGs whose brightness depends on the label. It is shuffled and filtered (HF
keeps an indices mapping; convert writes the mapped rows, in that order), converted with the
images decoded in Rust and resized to a dense 8x8 grey column, and the same rows exported to
Parquet are converted from the file. A logistic-regression model then trains from the Loader
over the converted root.

    python examples/convert_hf.py [WORKDIR]
"""

from __future__ import annotations

import io
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

import zrecord


def build_dataset(n=1200, seed=0):
    import datasets
    from PIL import Image

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    images, tokens = [], []
    for y in labels:
        h, w = rng.integers(12, 24, 2)
        px = np.clip(rng.normal(90 + 80 * y, 30, (h, w, 3)), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(px).save(buf, format="PNG")
        images.append({"bytes": buf.getvalue(), "path": None})
        tokens.append(rng.integers(0, 1000, rng.integers(4, 40)).tolist())
    features = datasets.Features(
        {
            "tokens": datasets.List(datasets.Value("int32")),
            "label": datasets.ClassLabel(names=["dark", "bright"]),
            "img": datasets.Image(),
        }
    )
    return datasets.Dataset.from_dict({"tokens": tokens, "label": labels.tolist(), "img": images}, features=features)


def convert_both(workdir):
    ds = build_dataset()
    ds = ds.shuffle(seed=1).filter(lambda r: len(r["tokens"]) > 6)
    root = Path(workdir) / "hf-root"
    report = zrecord.convert(ds, root, decode_images="HWC", image_mode="L", resize=(8, 8), progress=False)
    # The same rows through a Parquet file (images kept encoded: columns without `img`).
    ds.remove_columns(["img"]).to_parquet(str(Path(workdir) / "rows.parquet"))
    pq_report = zrecord.convert(str(Path(workdir) / "rows.parquet"), Path(workdir) / "pq-root", progress=False)
    return ds, root, report, pq_report


def stream_paths(root):
    meta = json.loads((Path(root) / "dataset.json").read_text())
    return {s["name"]: Path(root) / s["path"] for s in meta["streams"]}, meta


def train(workdir, steps=150, batch=64, lr=0.5):
    ds, root, report, pq_report = convert_both(workdir)
    paths, meta = stream_paths(root)
    allocator = zrecord.Allocator("cpu")
    streams = {
        "img": [zrecord.DenseStore(paths["img"]).bind(allocator)],
        "label": [zrecord.DenseStore(paths["label"]).bind(allocator)],
    }

    def to_numpy(shards):
        s = shards[0]
        x = np.from_dlpack(s["img"]).reshape(len(s["label"]), -1).astype(np.float32) / 255.0
        return x, np.from_dlpack(s["label"]).astype(np.float32)

    n = report["rows"]
    loader = zrecord.Loader(streams, zrecord.Sampler(n, batch, "cyclic", seed=7), workers=2, prefetch=2, transform=to_numpy)
    w = np.zeros(64, np.float32)
    b = 0.0
    losses = []
    for _ in range(steps):
        x, y = next(loader)
        p = 1.0 / (1.0 + np.exp(-(x @ w + b)))
        losses.append(float(-np.mean(y * np.log(p + 1e-7) + (1 - y) * np.log(1 - p + 1e-7))))
        g = p - y
        w -= lr * (x.T @ g) / len(y)
        b -= lr * float(g.mean())
    loader.close()
    return losses, ds, report, pq_report, meta


def main():
    workdir = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="zrecord-convert-")
    losses, ds, report, pq_report, meta = train(workdir)
    print(f"converted {report['rows']} HF rows in {report['seconds']:.2f} s; streams: {[s[0] for s in report['streams']]}")
    print(f"converted {pq_report['rows']} Parquet rows; class names kept: {meta['metadata']['huggingface']['class_labels']}")
    print(f"loss {np.mean(losses[:10]):.4f} -> {np.mean(losses[-10:]):.4f}")


if __name__ == "__main__":
    main()
