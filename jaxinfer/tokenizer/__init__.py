"""Text in and out: `tokenizer` (the tokenizer wrapper and the streaming detokenizer), `chat`
(conversations to prompts) and `templates` (the bundled chat templates).
"""
