import os

import numpy as np
import pytest

import zrecord

try:
    import ml_dtypes  # noqa: F401

    HAVE_ML_DTYPES = True
except ImportError:
    HAVE_ML_DTYPES = False

NUMPY_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float16", "float32", "float64", "complex64", "complex128"]
ML_DTYPES = ["bfloat16", "float8_e4m3fn", "float8_e5m2"]
CODECS = ["raw", "zstd", "zstd_dict"]


def random_array(dtype, shape, seed=0):
    """Random data of any catalog dtype (ml_dtypes ones are random bit patterns)."""
    rng = np.random.default_rng(seed)
    dt = zrecord.dtypes.as_numpy(dtype)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype in ML_DTYPES:
        bits = rng.integers(0, 256 ** dt.itemsize, size=shape, dtype=np.uint64)
        raw = bits.astype(np.uint16 if dt.itemsize == 2 else np.uint8)
        if dtype != "bfloat16":
            raw = raw & 0x77  # keep float8 values finite
        return raw.view(dt)
    if np.issubdtype(dt, np.integer):
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
    if np.issubdtype(dt, np.complexfloating):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    return (rng.standard_normal(shape) * 100).astype(dt)


def dict_for(arrays):
    samples = [np.ascontiguousarray(a).tobytes() for a in arrays]
    while len(samples) < 64:
        samples = samples + [s[::-1] for s in samples]
    return zrecord.train_dict(samples, 4096)


def writer_kwargs(codec, arrays):
    kw = {"codec": codec}
    if codec == "zstd_dict":
        kw["dict_bytes"] = dict_for(arrays)
    return kw


@pytest.fixture
def alloc():
    with zrecord.Allocator("cpu", pool_size_bytes=64 << 20) as a:
        yield a


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server on loopback for one test module, its settings in the environment
    (restored afterwards)."""
    pytest.importorskip("moto.server")
    pytest.importorskip("boto3")
    from _servers import S3Server

    srv = S3Server()
    saved = {k: os.environ.get(k) for k in srv.env}
    os.environ.update(srv.env)
    try:
        yield srv
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        srv.close()

