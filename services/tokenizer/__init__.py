"""The tokenizer service: text and chat messages to token ids and back."""
