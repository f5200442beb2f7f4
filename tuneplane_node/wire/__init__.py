"""The wire contract with the console: every request parser (`requests`, the launch;
`verbs`, `images`, `volumes`) and every JSON shape (`answers`) of the API. Pure data, no
I/O: the only place a field name of the contract is spelt.
"""

PROTOCOL = 1
PROTOCOLS = (PROTOCOL,)  # the versions this node speaks, as health and inventory say
SPOKEN = tuple(str(spoken) for spoken in PROTOCOLS)  # what the protocol header may carry
PROTOCOL_HEADER = "X-TunePlane-Node-Protocol"
MAX_BODY_BYTES = 1024 * 1024
