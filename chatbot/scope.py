"""Near-domain topics the docs do not cover: questions closer in meaning to one of them than to any
runbook section are declined.

Why: a training-recipe or model-format question ("what learning rate for a 7B model") shares words and
meaning with the runbooks that mention learning rates or checkpoints (TrainingLossSpike, NCCLTimeout),
so its BM25 + cosine score can clear the decline threshold although no runbook answers it. Comparing it
with a description of what the docs do not cover separates the two better than any single threshold
(measured on chatbot/eval/jobs_tuning.yaml and questions.yaml only; docs/chatbot.md). The topics are the
issue's list of near-domain subjects, written as topics, not as questions.
"""

from __future__ import annotations

import threading

import numpy as np

from .embed import shared_encoder

NOT_COVERED = (
    "Training recipes and hyperparameters: which learning rate, warmup, batch size, optimizer, weight "
    "decay, dropout, schedule, number of epochs or tokens to train a model with.",
    "Model file formats and conversion: safetensors, GGUF, GGML, ONNX, PyTorch and Hugging Face "
    "checkpoints, exporting and converting model weights.",
    "Tokenizers: BPE, SentencePiece, WordPiece, vocabulary size, training a tokenizer on a corpus.",
    "Fine-tuning methods and libraries: LoRA, QLoRA, PEFT, TRL, DPO, SFT, axolotl, quantizing a model "
    "to 8-bit or 4-bit.",
    "Choosing a parallelism strategy and framework: DeepSpeed ZeRO, FSDP, Megatron, tensor and pipeline "
    "parallel sizes.",
    "Serving models for inference: vLLM, TGI, TensorRT-LLM, latency and throughput of serving.",
    "Cloud prices: the cost of GPU hours on AWS, GCP or Azure, on-demand, reserved and spot instances.",
    "Preparing training data: deduplication, filtering, sequence packing, sharding datasets.",
)
# Decline when the question's cosine with the closest topic exceeds its cosine with the best runbook
# section by more than this. On the tuning sets every in-scope question is at least 0.107 closer to a
# runbook; 0 means "closer to a topic the docs do not cover than to anything they do".
NOT_COVERED_MARGIN = 0.0


class Scope:
    """The embedded topics, encoded once on first use. Thread-safe."""

    def __init__(self, topics: tuple[str, ...] = NOT_COVERED) -> None:
        self.topics = topics
        self._vectors: np.ndarray | None = None
        self._lock = threading.Lock()

    def vectors(self) -> np.ndarray:
        with self._lock:
            if self._vectors is None:
                self._vectors = shared_encoder().encode(list(self.topics))
            return self._vectors

    def uncovered(self, question_vector: np.ndarray, best_runbook_cosine: float, margin: float) -> str | None:
        """The topic the question is about when it is closer to it than to the runbooks, else None."""
        closeness = self.vectors() @ question_vector
        best = int(np.argmax(closeness))
        return self.topics[best] if closeness[best] - best_runbook_cosine > margin else None
