"""Near-duplicate detection: text MinHash + LSH (datasketch-compatible), image perceptual hashes, clusters, report."""
