"""The images wing of the job service: the credentials and private images by identity
(`keeper`), one pull per image (`pulls`; its rate, `jobs.words.rate`), the record of what the
node pulled and ran (`ledger`), the image GC (`gc`), prefetch (`prefetch`) and the list
the console reads (`catalog`)."""
