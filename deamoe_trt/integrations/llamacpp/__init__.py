"""llama.cpp: the vanilla twin as a GGUF file (`export`) and llama.cpp's own tools run on it as
`bench-lm --llama-bench`'s contender (`bench`)."""
