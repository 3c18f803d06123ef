"""Site matchers: the operand and shape contract of each op that day0's passes lower, written once.

One module per op (dsa_attention, mxfp4 (linear and moe), indexer_scores, topk), each with the op
name, a frozen dataclass for a matched site (operands, static dims, dtypes) and `match_<op>(op,
diag)`, which returns the site or reports why the op breaks the contract (at the op, through the
pass's DiagnosticEngine) and returns None. What only one lowering needs (a kernel's size limits,
a dtype it lacks) is that pass's own check, made after the match.
"""
