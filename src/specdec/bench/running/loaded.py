"""The models a bench run loads besides its pair, each once, held by the run (never set on the pair).

A run (:func:`specdec.bench.running.runner.run`) makes one :class:`BenchModels` and hands it to whatever
loads a model: :func:`specdec.bench.running.runner.pair_for` (a configuration's pair in another dtype or
on another backend), :func:`specdec.bench.running.peers.peer_draft` (a peer's copy of the draft in
another quantization), :func:`specdec.bench.running.peers.llama_model` (llama.cpp's model of the
target's GGUF file), :func:`specdec.bench.running.peers.openvino_pipeline` (OpenVINO GenAI's pipeline
on that file) and :func:`specdec.bench.running.llama_server.server_for` (llama.cpp's own server on it). A caller that runs several times on one pair may pass the same one to each
run, so those models load once in all; the run that made its own closes it at the end
(:meth:`BenchModels.close`: the servers stop), a caller that passed one closes it itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class BenchModels:
    """Models loaded for one pair during a bench run, by what asked for them."""

    #: (dtype, backend, is_ar) -> the pair a configuration runs on (:func:`specdec.bench.running.runner.pair_for`)
    variants: dict[tuple, Any] = field(default_factory=dict)
    #: draft quantization -> the draft model a peer runs (:func:`specdec.bench.running.peers.peer_draft`)
    peer_drafts: dict[str, Any] = field(default_factory=dict)
    #: llama.cpp settings -> the target's ``llama_cpp.Llama`` (:func:`specdec.bench.running.peers.llama_model`)
    llama: dict[tuple, Any] = field(default_factory=dict)
    #: OpenVINO GenAI settings -> the target's ``openvino_genai.LLMPipeline`` (:func:`specdec.bench.running.peers.openvino_pipeline`)
    openvino: dict[tuple, Any] = field(default_factory=dict)
    #: mode and settings -> llama.cpp's running server (:func:`specdec.bench.running.llama_server.server_for`)
    servers: dict[tuple, Any] = field(default_factory=dict)

    def close(self) -> None:
        """Stop llama.cpp's servers (each :meth:`~specdec.bench.running.llama_server.LlamaServer.close`)
        and forget them; the other models go with the last reference to them. Again: nothing."""
        servers, self.servers = list(self.servers.values()), {}
        for server in servers:
            server.close()
