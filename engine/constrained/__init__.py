"""Structured output: grammars (JSON schema, regex, EBNF) compiled with xgrammar, a matcher per
request, and the token bitmask that bans what the grammar does not allow next.

xgrammar is imported only when a constraint is used (compiler.py), so an engine without it serves
unconstrained requests; bitmask.py needs only torch.
"""
