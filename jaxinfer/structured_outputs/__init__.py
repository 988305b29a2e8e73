"""Constrained decoding: `params` (what a request's output must match), `grammar` (the
llguidance matchers and the per-step token bitmask) and `tool_calls` (the tool-call
convention, its grammar and parsing calls back).
"""
