"""Verification samplers, all in terms of a rule (h, r): ``chain`` (token-wise over a drafted block, batched;
greedy) and ``tree`` (the root-down walk of Appendix H.1). A rule never knows which of them verifies it."""

from verispec.core.verify.chain import VerifyResult, sample_categorical, verify_block, verify_greedy, verify_greedy_rule
from verispec.core.verify.tree import TokenTree, TreeVerifyResult, check_tree_rule, verify_tree

__all__ = ["TokenTree", "TreeVerifyResult", "VerifyResult", "check_tree_rule", "sample_categorical", "verify_block",
           "verify_greedy", "verify_greedy_rule", "verify_tree"]
