"""posttrain: compact RL post-training for LLMs."""
