#!/usr/bin/env python3
# Hostile readers: 50 clients each send one multiget naming a 500 KB key 100 times and never read;
# then one client sends a 2000-key line of the same key and reads nothing. RSS growth.
import os, socket, sys, time, subprocess, random
def rss(pid):
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS"): return int(l.split()[1])//1024
def run(cmd):
    P=random.randint(20000,40000)
    p=subprocess.Popen(cmd+["-p",str(P),"-U","0","-l","127.0.0.1","-m","64"],stderr=subprocess.DEVNULL)
    time.sleep(0.7)
    c=socket.create_connection(("127.0.0.1",P))
    v=b"v"*500000
    c.sendall(b"set big 0 0 500000\r\n"+v+b"\r\n"); c.recv(100)
    base=rss(p.pid)
    cs=[]
    for i in range(50):
        s=socket.create_connection(("127.0.0.1",P)); s.sendall(b"get"+b" big"*100+b"\r\n"); cs.append(s)
    s=socket.create_connection(("127.0.0.1",P)); s.sendall(b"get"+b" big"*2000+b"\r\n"); cs.append(s)
    time.sleep(3)
    grown=rss(p.pid)-base
    alive=p.poll() is None
    p.kill(); p.wait()
    return grown, alive
for name,cmd in (("memcached",["memcached","-u","root"]),("memfabricd",[os.environ.get("MEMFABRICD", "target/release/memfabricd"),"--ucx-port","0"])):
    print(name, "RSS growth MiB, alive:", run(cmd))
