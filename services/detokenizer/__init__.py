"""The detokenizer service: per-step token ids to text deltas, stop strings, fan-out to gateways."""
