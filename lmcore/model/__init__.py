"""The model, from scratch: primitives (`nn`), the attention operator (`attention`), input
checks (`inputs`), the KV cache (`cache`), the transformer (`transformer`), sizes from the
components' declarations (`counting`), decoding (`generate`) and the checkpoint writer
(`saving`). Nothing here imports from above `lmcore.model`; `lmcore.build_model` is
`transformer.build_model`.
"""
