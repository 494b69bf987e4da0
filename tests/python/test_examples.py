import importlib.util
import pathlib

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_train_numpy_example_learns(tmp_path):
    spec = importlib.util.spec_from_file_location("train_numpy", ROOT / "examples" / "train_numpy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    losses, state = mod.train(str(tmp_path), steps=200)
    assert state == {"step": 100}
    assert np.mean(losses[-20:]) < 0.6 * np.mean(losses[:20])
