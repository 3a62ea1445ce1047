"""Speculative decoding: proposers (n-gram prompt lookup, a draft model), lossless verification in one
target forward over the k+1 positions of each sequence, and a back-off policy."""
