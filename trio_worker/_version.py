"""The package version, in one place so payloads, pings and the User-Agent agree."""

__version__ = "0.1.0"
