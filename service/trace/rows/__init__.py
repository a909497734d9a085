"""The request's parts as rows: the variants (and RoPE's row), /multihead's weight forms, and
the fields folded into others before the rules. The rules, the plan and the steps loop over
these tables."""
