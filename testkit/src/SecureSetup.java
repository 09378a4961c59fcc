// Creates the SCRAM users and ACLs of the testkit's secured broker through Kafka's own
// Admin API, in one JVM (the image has no ACL command line tool). Run inside the broker's
// container as a single-file program:
//   java -cp '/opt/kafka/libs/*' SecureSetup.java BOOTSTRAP 'scram NAME PASSWORD' \
//        'acl PRINCIPAL RESOURCE_TYPE NAME PATTERN_TYPE OPERATION' ...
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ScramCredentialInfo;
import org.apache.kafka.clients.admin.ScramMechanism;
import org.apache.kafka.clients.admin.UserScramCredentialAlteration;
import org.apache.kafka.clients.admin.UserScramCredentialUpsertion;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourceType;

public class SecureSetup {
    public static void main(String[] args) throws Exception {
        Properties properties = new Properties();
        properties.put("bootstrap.servers", args[0]);
        List<UserScramCredentialAlteration> users = new ArrayList<>();
        List<AclBinding> acls = new ArrayList<>();
        for (int i = 1; i < args.length; i++) {
            String[] f = args[i].split(" ");
            if (f[0].equals("scram") && f.length == 3) {
                users.add(new UserScramCredentialUpsertion(
                    f[1], new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), f[2]));
            } else if (f[0].equals("acl") && f.length == 6) {
                acls.add(new AclBinding(
                    new ResourcePattern(ResourceType.valueOf(f[2]), f[3], PatternType.valueOf(f[4])),
                    new AccessControlEntry(f[1], "*", AclOperation.valueOf(f[5]), AclPermissionType.ALLOW)));
            } else {
                throw new IllegalArgumentException("not a scram or acl line: " + f[0]);
            }
        }
        try (Admin admin = Admin.create(properties)) {
            admin.alterUserScramCredentials(users).all().get(60, TimeUnit.SECONDS);
            admin.createAcls(acls).all().get(60, TimeUnit.SECONDS);
        }
        System.out.println("onceflow-secure-setup: " + users.size() + " users, " + acls.size() + " ACLs");
    }
}
