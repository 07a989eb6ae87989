"""verispec inside other engines. Each integration imports only torch and verispec's core, so it never ties the
host engine to verispec's own model stack (transformers pin, backends)."""
