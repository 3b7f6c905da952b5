"""The DF-MP2 energy stage: B, the pair step over spin channels, and its form over ranks."""
