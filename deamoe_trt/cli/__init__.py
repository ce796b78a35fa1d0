"""The `deamoe-trt` command line: one module per subcommand, shared argument groups in args.py."""
