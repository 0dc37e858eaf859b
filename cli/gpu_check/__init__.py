"""`rcswarm bench gpu`: everything that needs a GPU, in one command (issue #32).

- `report`: the rows of the table and the JSON document, the cards' peaks, the FLOP and byte counts the
  fractions of peak come from, the goals read out at the end (pure arithmetic: tested on the CPU).
- `kernels`: (a) the compiled Triton kernels (RWKV-Product, SGSA) against their naive references,
  forward and every gradient, float32 and bfloat16; (b) their timings with `triton.testing.do_bench`
  beside flash-linear-attention's chunked RWKV-7 kernel (when installed) and PyTorch SDPA.
- `bptt`: (c) streaming BPTT of the frame model on the device: peak memory and frames/s at long windows,
  each configuration in a child process with a time limit.
- `swarm`: (d) a 2-worker swarm (`rcswarm run`) on the one device for a few rounds.

The command is `cli/bench_gpu.py`. Without CUDA it prints one line and exits 0; `--device cpu` runs the
parts that can run on the CPU (for tests of the plumbing, not measurements).
"""
