"""The jobs: build (and its Dask tasks), dedup (and its Dask tasks), the task loop, the cluster."""
