"""What timewheel's tests and benches share: real servers to run against (a pytest plugin
holds their fixtures), settings, fixed clocks, and helpers that read or drive a
deployment. Nothing in timewheel itself imports this package."""
