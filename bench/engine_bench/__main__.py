from bench.engine_bench.run import main

main()
