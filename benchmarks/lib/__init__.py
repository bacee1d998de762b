"""What the benchmarks and the tests share: the job runner (``harness``), the settings of small and paper-scale runs
(``fedrevive_small``, ``scales``) and the null trainer a job can run with (``null_training``). It imports no other
part of ``benchmarks``, so a bench or a test that uses it pulls in no other bench."""
