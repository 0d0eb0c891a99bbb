"""Weight sync: the policy's weights into the generation engines after every train step.

``refit.refit(policy, engines, probe)`` is the one entry; ``transport`` (how the weights travel),
``sender`` (the policy workers' side), ``receiver`` (the engines' side, one strictness),
``broadcast`` (the collective and its bucket plan), ``receipt`` and ``probe`` are its parts
(docs/architecture.md, "Weight sync").
"""
