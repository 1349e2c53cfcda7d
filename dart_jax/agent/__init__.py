"""The agent side of the policy: UI-TARS prompts as token ids (no torch, no JAX).

`prompt` needs `tokenizers`; `actions` and `image_processing` (what env servers and the
config loader import) need only numpy and PIL, so this package imports none of its modules.
"""
