"""Model execution backends: score a block against a KV cache, roll back."""
