"""Pieces every architecture may build from, below all of them: the token-mixer interface,
decoding state, shared layers (per-channel projections and norms, GeGLU, the residual
stream), rotary embedding, softmax attention with its KV cache, and the fixed decays."""
