"""The fleet store: :class:`FleetDB` over SQLite or PostgreSQL, its schema and every query of the fleet's tables."""
