"""The host side of agentvm's hybrid vsock socket, for the vm-tier scripts."""
import socket


def open_guest_port(uds, port):
    """Connects through the Unix socket to the guest's vsock port.

    Returns (socket, answer line): the line is b"OK <n>\\n" when the guest accepted, and
    whatever arrived before the stream closed otherwise.
    """
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(120)
    s.connect(uds)
    s.sendall(b"CONNECT %d\n" % port)
    line = b""
    while not line.endswith(b"\n"):
        b = s.recv(1)
        if not b:
            break
        line += b
    return s, line
