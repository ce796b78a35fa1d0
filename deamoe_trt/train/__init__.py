"""The train stage: recipes that train small DeaMoE language models from scratch on shipped text."""
