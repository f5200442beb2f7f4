"""A card's fault turned into what it reaches: the job told, the job warned and stopped,
or the node cordoned and drained."""
