"""tailguard controller: policies, the breach engine, sources, actuators, journal, API and CLI."""
