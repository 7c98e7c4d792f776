"""What the benchmark writes and reads: nccl-tests' table (:mod:`.report`), the summary after it
(:mod:`.summary`), the JSON document and the JSON-lines log (:mod:`.results`), nccl-tests' logs
(:mod:`.logs`), and the text tables of the offline tools (:mod:`.tables`)."""
