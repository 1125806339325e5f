"""Evaluation: loss, perplexity and bits per byte over text or prepared data in windows
(`windows`, `bpb`), the model and tokenizer to evaluate (`loading`), batched log-likelihoods
through the KV cache (`scoring`) and lmcore's model for lm-evaluation-harness (`harness`).

    from lmcore.eval.windows import evaluate_stream, text_stream
    import lmcore.eval.harness  # registers the lm-eval model "lmcore"
"""
