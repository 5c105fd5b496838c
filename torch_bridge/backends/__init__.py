"""Backends of ``torch_bridge``; each module exposes ``BACKEND`` (see ``torch_bridge._dispatch``).

``aiter`` (AITER on gfx950), ``triton`` (package), ``deepgemm`` (DeepGEMM's sm_90 GEMM after
Triton's quant; only when named), ``torch_ref`` (backend name ``torch``: the pure-torch
reference) and ``bf16`` (the BF16 chain). Modules are imported on first use only.
"""
