"""The bundled serving tier: engine profiles, simulator, router, deployer and load replay."""
